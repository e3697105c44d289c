"""Layer 2 — bytes <-> tar members <-> samples: tar parsing and writing, damage recovery, sample
grouping, and the shard writer (rollover, receipts, atomic publication).

Reading: tar_blocks (buffered exact reads; tar_decompress for gzip/bzip2/xz/zstd) -> tar_read.iter_members
(tar_headers for the fields, tar_recover at damage, tar_sparse) -> samples.iter_samples (keys for the
key rule, sample_recover next to damage). Writing: writer (TarWriter, ShardWriter) -> tar_write
(framing, the compression stage the name asks for: formats) -> sinks (hash + write threads) ->
storage.publish (atomic commit per storage kind); committer commits finished shards in the background."""
