"""features: a torchvision model's features for every image, as an .npy entry beside the sample's own.

The model (PARAMS["model"], any name torchvision.models.get_model knows) is built once per worker in
setup(), with weights=None or the weights of PARAMS["checkpoint"] (a state_dict saved by torch.save,
read with weights_only=True; nothing is ever downloaded), its classifier replaced by the identity,
put in eval mode on the worker's device (the GPU when there is one). Each batch is resized (shorter
side to `size`), centre-cropped, normalised with the ImageNet statistics and run through the model
under inference_mode; output sample = the input sample's entries, byte for byte, plus
`features.npy` (float32, one vector; feature maps are averaged over their spatial axes).

Run it:

    shardflow run features --inputs 'data/train-{000000..000099}.tar' --outputs 'feat/{name}.tar' \\
        --set checkpoint=/models/resnet50.pt --set model=resnet50 --gpus-per-worker 1

PARAMS (all settable with --set):
    model       torchvision model name (resnet18, resnet50, vit_b_16, efficientnet_b0, ...)
    checkpoint  path or URL of a state_dict for that model (null: random weights, for tests/timing)
    size        input side after resize + centre crop
    output      entry the features are written to
    image_key   entry holding the image (null: the first of jpg, jpeg, png, webp)
"""

import torch
from torchvision.transforms.v2 import functional as F

import shardflow as sf

JOB = dict(decode="torchrgb8", batch_size=64, device="auto")
PARAMS = dict(model="resnet18", checkpoint=None, size=224, output="features.npy", image_key=None)

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
HEADS = ("fc", "classifier", "heads", "head")


def setup():
    """Once per worker: the model, without its classifier, on this worker's device."""
    import torchvision

    device = sf.worker_device()
    model = torchvision.models.get_model(PARAMS["model"], weights=None)
    if PARAMS["checkpoint"]:
        import fsspec

        with fsspec.open(PARAMS["checkpoint"], "rb") as f:
            state = torch.load(f, map_location="cpu", weights_only=True)
        for wrapper in ("state_dict", "model"):
            if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
                state = state[wrapper]
        model.load_state_dict(state)
    for head in HEADS:
        if hasattr(model, head):
            setattr(model, head, torch.nn.Identity())
            break
    return {"model": model.eval().to(device), "device": device}


def prepare(image, size):
    """uint8 CHW -> normalised float CHW of size x size."""
    image = F.resize(image, [size], antialias=True)
    image = F.center_crop(image, [size, size])
    return F.normalize(image.float().div_(255), MEAN, STD)


def process_batch(batch, state):
    key = PARAMS["image_key"]
    images, keep = [], []
    for sample in batch:
        name = key or next((k for k in IMAGE_KEYS if k in sample), None)
        if name is None or name not in sample:
            continue  # no image: dropped
        image = sample[name]
        if image.dtype != torch.uint8:
            image = image.mul(255).round_().clamp_(0, 255).to(torch.uint8)
        images.append(prepare(image.to(state["device"]), PARAMS["size"]))
        keep.append(sample)
    if not keep:
        return []
    with torch.inference_mode():
        features = state["model"](torch.stack(images))
    if features.ndim > 2:
        features = features.mean(dim=tuple(range(2, features.ndim)))
    vectors = features.float().cpu().numpy()
    return [{**sample, PARAMS["output"]: vector.copy()} for sample, vector in zip(keep, vectors)]
