"""augment_batch: image augmentation over batches on the job's device (torchvision v2); writes jpg + cls.

Per sample: a random resized crop to PARAMS["size"] (area fraction `scale`, aspect `ratio`), a
left-right flip with probability 1/2, colour jitter (brightness, contrast, saturation factors drawn in
[1 - x, 1 + x]) and Gaussian noise; then JPEG. The geometric ops run per image
(torchvision.transforms.v2.functional), the colour ops and the noise on the whole batch at once, on
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

import torch
from torchvision.transforms.v2 import functional as F

import shardflow as sf

JOB = dict(decode="torchrgb8", batch_size=64, device="auto", encode=dict(jpeg_quality=90))
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


def jitter(images, factors):
    """Brightness, contrast, saturation (v2's blend formulas) with one factor per image: (B,) each."""
    b, c, s = (f.view(-1, 1, 1, 1) for f in factors)
    images = (images * b).clamp_(0, 1)
    gray = F.rgb_to_grayscale(images)
    mean = gray.mean(dim=(1, 2, 3), keepdim=True)
    images = (c * images + (1 - c) * mean).clamp_(0, 1)
    gray = F.rgb_to_grayscale(images)
    return (s * images + (1 - s) * gray).clamp_(0, 1)


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
        if image.dtype != torch.uint8:
            image = image.mul(255).round_().clamp_(0, 255).to(torch.uint8)
        rng = sf.sample_rng(sample, "torch")  # CPU generator: the same boxes on every device
        top, left, h, w = crop_box(image.shape[-2], image.shape[-1], rng, p["scale"], p["ratio"])
        image = F.resized_crop(image.to(device), top, left, h, w, [p["size"], p["size"]], antialias=True)
        if p["flip"] and torch.rand((), generator=rng).item() < 0.5:
            image = F.horizontal_flip(image)
        crops.append(image)
        factors.append([_factor(rng, p["brightness"]), _factor(rng, p["contrast"]), _factor(rng, p["saturation"])])
        keep.append(sample)
    if not keep:
        return []
    images = torch.stack(crops).float().div_(255)
    images = jitter(images, torch.tensor(factors, device=device).unbind(1))
    if p["noise"]:
        noise = torch.stack([torch.randn(images.shape[1:], generator=sf.device_rng(s, device), device=device)
                             for s in keep])
        images = images.add_(noise.mul_(p["noise"])).clamp_(0, 1)
    pixels = images.mul_(255).round_().to(torch.uint8)
    return [_output(sample, image) for sample, image in zip(keep, pixels)]


def _output(sample, image):
    out = {"__key__": sample["__key__"], "jpg": image}
    label_key = PARAMS["label_key"]
    meta = sample.get("json")
    if label_key and isinstance(meta, dict) and label_key in meta:
        out["cls"] = int(meta[label_key])
    return out
