"""torchvision's ResNet-18 (BatchNorm, 11.2M parameters) on an ImageFolder, with FedProx and Adam.

To stay self-contained, the example first writes a tiny folder of generated images, one subfolder per
class, as ImageFolder reads them (with real data, point ImageFolder at your folders).
"""

from pathlib import Path

import torch
from PIL import Image
from torchvision import datasets, models, transforms

import taciturn

root, g = Path("runs/shades"), torch.Generator().manual_seed(0)
for split, count in (("train", 24), ("test", 8)):
    for shade, name in enumerate(["dark", "light"]):
        (root / split / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            pixels = (torch.rand(32, 32, 3, generator=g) + shade) * 127
            Image.fromarray(pixels.to(torch.uint8).numpy()).save(root / split / name / f"{i}.png")

to_tensor = transforms.Compose([transforms.Resize(32), transforms.ToTensor()])
train = datasets.ImageFolder(root / "train", transform=to_tensor)  # (image, class) items
test = datasets.ImageFolder(root / "test", transform=to_tensor)
config = {
    "rounds": 2,
    "partition": {"kind": "iid", "num_clients": 4},
    "algorithm": {
        "name": "fedprox",
        "fraction": 0.5,
        "local": {"steps": 2, "batch_size": 8, "optimizer": "adam", "lr": 1e-3},
    },
}
result = taciturn.run(config, model=models.resnet18(num_classes=2), data=(train, test), out="runs/resnet18")
print(result.metrics[-1]["accuracy"])
