"""augment_batch: image augmentation over batches on the job's device (torch only); writes jpg + cls.

Per sample: a random resized crop to PARAMS["size"] (area fraction `scale`, aspect `ratio`), a
left-right flip with probability 1/2, colour jitter (brightness, contrast, saturation factors drawn in
[1 - x, 1 + x]) and Gaussian noise; then JPEG. The geometric ops run per image (a crop, then torch's
antialiased bilinear resize: the pixels of torchvision v2's resized_crop, without importing
torchvision, 0.8 s of CPU per process), the colour ops and the noise on the whole batch at once, on
the GPU when the worker has one (device "auto"; decode "torchrgb8-cuda" decodes there too, and the
JPEGs are then encoded there as well). Every random number comes from the sample's own generators
(`sf.sample_rng`, `sf.device_rng`), so a rerun writes identical bytes, whatever the batch size, on
the same kind of device (GPU and CPU results differ in rounding).

Run it:

    shardflow run augment_batch --inputs 'data/train-{000000..000003}.tar' --outputs 'aug/{name}.tar'
    shardflow run augment_batch -i ... --outputs ... --set decode=torchrgb8-cuda --gpus-per-worker 1

PARAMS (all settable with --set):
    size        side of the square output image
    scale       [min, max] fraction of the image area the crop keeps
    ratio       [min, max] aspect ratio of the crop
    flip        flip left-right with probability 1/2
    brightness  jitter strength (0 disables), likewise contrast and saturation
    noise       standard deviation of the added Gaussian noise, on [0, 1] pixels (0 disables)
    label_key   json field holding the class label (null: no cls written)
    image_key   entry holding the image (null: the first of jpg, jpeg, png, webp)
"""

import math

import numpy as np
import torch

import shardflow as sf

# rgb8: HWC uint8 as decoded (no transposing copy); seen as a CHW tensor with channels-last strides,
# which torch's antialiased resize also reads faster. decode=torchrgb8-cuda decodes on the GPU.
JOB = dict(decode="rgb8", batch_size=64, device="auto", encode=dict(jpeg_quality=90))
PARAMS = dict(size=224, scale=[0.08, 1.0], ratio=[0.75, 4 / 3], flip=True, brightness=0.4, contrast=0.4,
              saturation=0.4, noise=0.02, label_key="label", image_key=None)

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")


def crop_box(height, width, rng, scale, ratio):
    """torchvision's RandomResizedCrop box (10 tries, then the centre crop), drawn from rng."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        u = torch.rand(3, generator=rng).tolist()
        target = area * (scale[0] + u[0] * (scale[1] - scale[0]))
        aspect = math.exp(log_ratio[0] + u[1] * (log_ratio[1] - log_ratio[0]))
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (), generator=rng))
            left = int(torch.randint(0, width - w + 1, (), generator=rng))
            return top, left, h, w
    side = min(height, width)
    return (height - side) // 2, (width - side) // 2, side, side


def resized_crop(image, top, left, height, width, size):
    """The box of a CHW image resized to size x size, bilinear with antialiasing: the pixels of
    torchvision v2's resized_crop (antialias=True), from torch alone."""
    crop = image[None, :, top : top + height, left : left + width]
    return torch.nn.functional.interpolate(crop, size=(size, size), mode="bilinear", antialias=True,
                                           align_corners=False)[0]


GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


def jitter(images, factors):
    """Brightness, contrast, saturation (v2's blend formulas) with one factor per image: (B,) each.

    In place on the float batch, every step one pass or two: the batch is the largest thing this job
    touches, so passes over it are its cost (the contrast's mean is the grey image's mean, taken from
    the channel means without making the grey image)."""
    b, c, s = (f.view(-1, 1, 1, 1) for f in factors)
    images.mul_(b).clamp_(0, 1)
    channel_means = images.mean(dim=(2, 3))
    mean = sum(channel_means[:, i] * w for i, w in enumerate(GRAY)).view(-1, 1, 1, 1)
    images.mul_(c).add_((1 - c) * mean).clamp_(0, 1)
    gray = images[:, 0:1] * GRAY[0]
    gray.add_(images[:, 1:2], alpha=GRAY[1]).add_(images[:, 2:3], alpha=GRAY[2])
    return images.mul_(s).add_(gray.mul_(1 - s)).clamp_(0, 1)


def _factor(rng, strength):
    return 1.0 + strength * (2 * torch.rand((), generator=rng).item() - 1) if strength else 1.0


def process_batch(batch):
    device = sf.worker_device()
    p = PARAMS
    crops, factors, keep = [], [], []
    for sample in batch:
        key = p["image_key"] or next((k for k in IMAGE_KEYS if k in sample), None)
        if key is None or key not in sample:
            continue  # no image: dropped (counted as dropped)
        image = sample[key]
        if isinstance(image, np.ndarray):  # HWC from decode "rgb8" -> a CHW view, no copy
            image = torch.from_numpy(image).permute(2, 0, 1)
        if image.dtype != torch.uint8:
            image = image.mul(255).round_().clamp_(0, 255).to(torch.uint8)
        rng = sf.sample_rng(sample, "torch")  # CPU generator: the same boxes on every device
        top, left, h, w = crop_box(image.shape[-2], image.shape[-1], rng, p["scale"], p["ratio"])
        image = resized_crop(image.to(device), top, left, h, w, p["size"])
        if p["flip"] and torch.rand((), generator=rng).item() < 0.5:
            image = image.flip(-1)
        crops.append(image)
        factors.append([_factor(rng, p["brightness"]), _factor(rng, p["contrast"]), _factor(rng, p["saturation"])])
        keep.append(sample)
    if not keep:
        return []
    images = _buffer("images", (len(crops), *crops[0].shape), device)  # crops share one size
    for row, crop in zip(images, crops):
        torch.mul(crop, 1 / 255, out=row)  # uint8 -> [0, 1] floats in one pass, no stacked copy
    images = jitter(images, torch.tensor(factors, device=device).unbind(1))
    if p["noise"]:
        noise = _buffer("noise", images.shape, device)
        for row, sample in zip(noise, keep):
            torch.randn(row.shape, generator=sf.device_rng(sample, device), device=device, out=row)
        images.add_(noise, alpha=p["noise"]).clamp_(0, 1)
    pixels = images.mul_(255).round_().to(torch.uint8)
    return [_output(sample, image) for sample, image in zip(keep, pixels)]


_BUFFERS = {}


def _buffer(name, shape, device):
    """A float batch buffer kept for the next batch: a fresh one (38 MB at 64 x 3 x 224 x 224) is a
    fresh mmap every batch, whose page faults cost more than the arithmetic done in it."""
    key = (name, tuple(shape), str(device))
    if key not in _BUFFERS:
        if len(_BUFFERS) >= 4:  # a short last batch, another device: keep a few
            _BUFFERS.clear()
        _BUFFERS[key] = torch.empty(shape, device=device)
    return _BUFFERS[key]


def _output(sample, image):
    out = {"__key__": sample["__key__"], "jpg": image}
    label_key = PARAMS["label_key"]
    meta = sample.get("json")
    if label_key and isinstance(meta, dict) and label_key in meta:
        out["cls"] = int(meta[label_key])
    return out
