"""reshard: repack samples into shards of a chosen size, without decoding anything.

Samples are copied byte for byte. Each task reads `inputs_per_task` input shards in
order and writes them into parts of at most `maxcount` samples and `maxsize` bytes (a shard is
never larger than maxsize unless one sample alone is); the last part of each task holds the rest.
Use an output pattern with {task} and {part}. Many small shards -> fewer big ones: group inputs
with inputs_per_task; big shards -> smaller ones: one input per task and a small maxcount/maxsize.

Run it:

    # 1000 small shards -> shards of 10,000 samples (10 inputs per task)
    shardflow run reshard --inputs 'small/part-{000000..000999}.tar' \\
        --outputs 'big/train-{task:05d}-{part:03d}.tar' --set inputs_per_task=10 --set maxcount=10000
    # split into shards of at most 500 MB
    shardflow run reshard --inputs 'data/*.tar' --outputs 'out/{name}-{part:03d}.tar' --set maxsize=5e8

Settings (--set): maxcount, maxsize (bytes; 5e8 works), inputs_per_task.
"""

JOB = dict(decode=None, maxcount=10000, maxsize=None, inputs_per_task=1)


def process(sample):
    return sample
