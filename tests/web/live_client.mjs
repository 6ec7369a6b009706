// Drives rigd's live view (/foxglove) with Foxglove's own client, @foxglove/ws-protocol's
// FoxgloveClient over `ws`, and prints one JSON object with what it saw. tests/e2e/test_live_view.py
// runs it:
//   node tests/web/live_client.mjs URL [--protocol P]... [--subscribe TOPIC]... [--seconds S]
//        [--unsubscribe-after S] [--pause-after S --pause-for S] [--want-channels N]
// --ca FILE: trust this CA for a wss:// URL.
// --post URL --post-body JSON [--post-after S]: once subscribed (and S seconds later), POST the JSON
// to URL (a marker to the rig's /api/events; --post-token T: with `Authorization: Bearer T`) and
// record the answer as `posted`.
// --want-channels: wait for N channels (a server may advertise them one source at a time, as
// `rigd live` does when a source's first message arrives) before subscribing.
// Messages are decoded with the protobuf schema the server advertised (protobufjs, from the
// channel's base64 FileDescriptorSet), as Foxglove's app decodes them. Times are printed as strings
// (ns do not fit a double); `at` is milliseconds since the client started.
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import wsProtocol from "@foxglove/ws-protocol";
import WebSocket from "ws";

const { FoxgloveClient } = wsProtocol;
import protobuf from "protobufjs";
import descriptor from "protobufjs/ext/descriptor/index.js";

const args = process.argv.slice(2);
const url = args.shift();
const opt = { protocol: [], subscribe: [], seconds: 2, wantChannels: 1 };
while (args.length) {
  const k = args.shift().replace(/^--/, "");
  const v = args.shift();
  if (k === "protocol" || k === "subscribe") opt[k].push(v);
  else if (k === "ca") opt.ca = readFileSync(v);
  else if (k === "post" || k === "post-body" || k === "post-token") opt[k.replace(/-(.)/g, (_, c) => c.toUpperCase())] = v;
  else opt[k.replace(/-(.)/g, (_, c) => c.toUpperCase())] = Number(v);
}
const t0 = performance.now();
// Exits once the report is written: stdout to a pipe is asynchronous, and process.exit() before
// the write ends would cut the report at 64 KiB.
const finish = (report, code = 0) => process.stdout.write(JSON.stringify(report) + "\n", () => process.exit(code));
const at = () => Math.round((performance.now() - t0) * 10) / 10;
const out = { protocol: null, serverInfo: null, channels: [], messages: [], times: [], statuses: [], events: [],
  // This host's clock (ns since the epoch) at `at` = 0: arrival time = t0Ns + at * 1e6.
  t0Ns: String(BigInt(Math.round((performance.timeOrigin + t0) * 1000)) * 1000n) };

const ws = new WebSocket(url, opt.protocol.length ? opt.protocol : [FoxgloveClient.SUPPORTED_SUBPROTOCOL],
  opt.ca ? { ca: opt.ca } : {});
ws.on("unexpected-response", (_req, res) => {
  let body = "";
  res.on("data", (d) => (body += d));
  res.on("end", () => {
    finish({ refused: res.statusCode, body });
  });
});
const client = new FoxgloveClient({ ws });
const byChannel = new Map();
const bySub = new Map();

function decoderFor(ch) {
  const set = descriptor.FileDescriptorSet.decode(Buffer.from(ch.schema, "base64"));
  const root = protobuf.Root.fromDescriptor(set);
  return root.lookupType(ch.schemaName);
}

// protobufjs keeps the .proto field names (snake_case) when it builds types from a descriptor.
function summary(ch, msg) {
  const ns = (ts) => (ts ? (BigInt(ts.seconds?.toString() ?? 0) * 1000000000n + BigInt(ts.nanos ?? 0)).toString() : null);
  switch (ch.schemaName) {
    case "foxglove.CompressedImage":
      return { timestamp: ns(msg.timestamp), format: msg.format, frameId: msg.frame_id ?? msg.frameId,
               bytes: msg.data.length, sha256: createHash("sha256").update(msg.data).digest("hex") };
    case "foxglove.CompressedVideo":
      return { timestamp: ns(msg.timestamp), format: msg.format, frameId: msg.frame_id ?? msg.frameId,
               bytes: msg.data.length, data: Buffer.from(msg.data).toString("base64") };
    case "foxglove.RawAudio":
      return { timestamp: ns(msg.timestamp), format: msg.format, sampleRate: msg.sample_rate ?? msg.sampleRate,
               channels: msg.number_of_channels ?? msg.numberOfChannels, bytes: msg.data.length };
    case "foxglove.LocationFix":
      return { timestamp: ns(msg.timestamp), latitude: msg.latitude, longitude: msg.longitude };
    case "foxglove.Log":
      return { timestamp: ns(msg.timestamp), level: msg.level, name: msg.name, message: msg.message };
    case "rigd.CanFrame":
      return { timestamp: ns(msg.timestamp), id: msg.id, extended: msg.extended, fd: msg.fd,
               data: Buffer.from(msg.data).toString("hex") };
    default:
      // A CAN source's decoded DBC message (rigd.can.{Message}): its signals, NaN as null.
      if (ch.schemaName.startsWith("rigd.can.")) {
        const signals = {};
        for (const f of ch.decoder.fieldsArray) if (f.name !== "timestamp") signals[f.name] = msg[f.name];
        return { timestamp: ns(msg.timestamp), signals };
      }
      return {};
  }
}

const advertised = [];
const ready = new Promise((resolve) =>
  client.on("advertise", (channels) => {
    advertised.push(...channels);
    if (advertised.length >= opt.wantChannels) resolve(advertised);
  }),
);
client.on("open", () => {
  out.protocol = ws.protocol;
});
client.on("serverInfo", (info) => (out.serverInfo = info));
// A channel withdrawn after it was advertised (a camera's full resolution once its proxy shows).
out.unadvertised = [];
client.on("unadvertise", (ids) => out.unadvertised.push(...ids));
client.on("status", (s) => out.statuses.push({ at: at(), level: s.level, message: s.message }));
client.on("error", (e) => out.events.push({ at: at(), error: String(e?.message ?? e) }));
client.on("close", (e) => out.events.push({ at: at(), close: e?.code ?? null }));
client.on("time", (t) => out.times.push({ at: at(), ns: t.timestamp.toString() }));
client.on("message", ({ subscriptionId, timestamp, data }) => {
  const ch = bySub.get(subscriptionId);
  if (!ch) return out.events.push({ at: at(), error: `message for unknown subscription ${subscriptionId}` });
  let decoded;
  try {
    decoded = summary(ch, ch.decoder.decode(new Uint8Array(data.buffer, data.byteOffset, data.byteLength)));
  } catch (e) {
    decoded = { error: String(e) };
  }
  out.messages.push({ at: at(), topic: ch.topic, receiveNs: timestamp.toString(), ...decoded });
});

const channels = await Promise.race([ready, new Promise((r) => setTimeout(() => r(null), opt.wantChannels > 1 ? 30000 : 10000))]);
if (!channels) {
  finish({ ...out, error: `fewer than ${opt.wantChannels} channels advertised within 10 s` }, 1);
  await new Promise(() => {});
}
for (const ch of channels) {
  out.channels.push({ id: ch.id, topic: ch.topic, encoding: ch.encoding, schemaName: ch.schemaName,
                      schemaEncoding: ch.schemaEncoding });
  byChannel.set(ch.topic, { ...ch, decoder: decoderFor(ch) });
}
const subs = [];
for (const topic of opt.subscribe) {
  const ch = byChannel.get(topic);
  if (!ch) continue;
  const id = client.subscribe(ch.id);
  bySub.set(id, ch);
  subs.push(id);
}
out.subscribedAt = at();
const sleep = (s) => new Promise((r) => setTimeout(r, s * 1000));
if (opt.post) {
  await sleep(opt.postAfter ?? 0);
  const headers = { "Content-Type": "application/json" };
  if (opt.postToken) headers.Authorization = `Bearer ${opt.postToken}`;
  const res = await fetch(opt.post, { method: "POST", headers, body: opt.postBody });
  out.posted = { at: at(), status: res.status, body: await res.text() };
}
if (opt.unsubscribeAfter !== undefined) {
  await sleep(opt.unsubscribeAfter);
  for (const id of subs) client.unsubscribe(id);
  out.unsubscribedAt = at();
  await sleep(opt.seconds - opt.unsubscribeAfter);
} else if (opt.pauseAfter !== undefined) {
  await sleep(opt.pauseAfter);
  ws.pause();
  out.pausedAt = at();
  await sleep(opt.pauseFor);
  ws.resume();
  out.resumedAt = at();
  await sleep(opt.seconds);
} else {
  await sleep(opt.seconds);
}
client.close();
out.endedAt = at();
finish(out);
