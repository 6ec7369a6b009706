// Reads an MCAP file with @mcap/core's McapIndexedReader (the reader Foxglove's app uses) and prints
// one JSON object: schemas, per-topic counts from the summary's statistics, per-topic counts of a
// time-range query [START_NS, END_NS] (inclusive, as readMessages takes it), the metadata record
// names, and which chunks the query read (byte ranges requested from the file, matched against the
// chunk indexes). tests/e2e/test_mcap.py runs it:
//   node tests/web/mcap_read.mjs FILE START_NS END_NS
import { open } from "node:fs/promises";
import { McapIndexedReader } from "@mcap/core";
import { loadDecompressHandlers } from "@mcap/support";

const [path, start, end] = process.argv.slice(2);
const file = await open(path, "r");
const size = (await file.stat()).size;
const reads = [];
const readable = {
  size: async () => BigInt(size),
  read: async (offset, length) => {
    reads.push([Number(offset), Number(length)]);
    const buf = new Uint8Array(Number(length));
    const { bytesRead } = await file.read(buf, 0, buf.length, Number(offset));
    if (bytesRead !== buf.length) throw new Error(`short read at ${offset}`);
    return buf;
  },
};
const reader = await McapIndexedReader.Initialize({
  readable,
  decompressHandlers: await loadDecompressHandlers(),
});
const initialized = reads.length;
const topicOf = (id) => reader.channelsById.get(id).topic;
const rangeCounts = {};
for await (const m of reader.readMessages({ startTime: BigInt(start), endTime: BigInt(end) })) {
  const topic = topicOf(m.channelId);
  rangeCounts[topic] = (rangeCounts[topic] ?? 0) + 1;
}
const rangeReads = reads.slice(initialized);
const chunksRead = reader.chunkIndexes.filter((c) => {
  const from = Number(c.chunkStartOffset);
  const to = from + Number(c.chunkLength);
  return rangeReads.some(([o, n]) => o < to && o + n > from);
}).length;
const counts = {};
for (const [id, n] of reader.statistics?.channelMessageCounts ?? []) {
  counts[topicOf(id)] = Number(n);
}
const metadata = [];
for await (const m of reader.readMetadata()) metadata.push(m.name);
console.log(JSON.stringify({
  schemas: [...reader.schemasById.values()].map((s) => ({ name: s.name, encoding: s.encoding })),
  counts,
  rangeCounts,
  chunks: reader.chunkIndexes.length,
  chunksRead,
  initializeReads: initialized,
  fileBytes: size,
  bytesReadForRange: rangeReads.reduce((a, [, n]) => a + n, 0),
  metadata,
}));
await file.close();
