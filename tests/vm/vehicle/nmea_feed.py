"""The GPS receiver of the vehicle in a box: writes NMEA sentences (GGA and RMC with valid
checksums) at RATE Hz into the unix socket behind the guest's third UART (QEMU `-chardev socket`),
reconnecting whenever QEMU goes away (a power cut) and comes back. Runs until killed.

  nmea_feed.py SOCKET [RATE_HZ]"""

import socket
import sys
import time


def sentence(body: str) -> bytes:
    x = 0
    for ch in body.encode():
        x ^= ch
    return f"${body}*{x:02X}\r\n".encode()


def fixes(rate: float):
    n = 0
    while True:
        t = time.gmtime()
        hms = time.strftime("%H%M%S", t) + f".{int(time.time() * 100) % 100:02d}"
        lat = 4807.038 + (n % 1000) * 0.001
        yield sentence(f"GPGGA,{hms},{lat:08.3f},N,01131.000,E,1,08,0.9,545.4,M,46.9,M,,")
        yield sentence(f"GPRMC,{hms},A,{lat:08.3f},N,01131.000,E,022.4,084.4,{time.strftime('%d%m%y', t)},003.1,W")
        n += 1
        time.sleep(1 / rate)


def main() -> None:
    path = sys.argv[1]
    rate = float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
    sent = 0
    while True:
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
        except OSError:
            time.sleep(0.5)
            continue
        s.settimeout(5)
        try:
            for line in fixes(rate):
                s.sendall(line)
                sent += 1
        except OSError:
            s.close()
            time.sleep(0.5)


if __name__ == "__main__":
    main()
