"""Runs one command in the guest's autologin root shell on a serial port (a unix socket on the
host) and prints its output: the command is wrapped in unique markers to find where it ends."""
import socket, sys, time, uuid

path, cmd, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 60
tag = uuid.uuid4().hex[:8]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
s.settimeout(1)
# The extra `echo` ends output that has no final newline (curl's JSON) before the end marker.
s.sendall(f"\necho B{tag}; {cmd}; echo; echo E{tag}\n".encode())
buf, deadline = b"", time.time() + timeout
while time.time() < deadline:
    try:
        d = s.recv(65536)
    except socket.timeout:
        d = b""
    buf += d
    text = buf.decode(errors="replace").replace("\r", "")
    # The markers as printed (not as echoed in the typed command line).
    start = text.find(f"\nB{tag}\n")
    end = text.find(f"\nE{tag}\n", start + 1) if start >= 0 else -1
    if start >= 0 and end >= 0:
        print(text[start + len(tag) + 3:end].strip())
        sys.exit(0)
sys.stderr.write(buf.decode(errors="replace")[-2000:])
sys.exit(1)
