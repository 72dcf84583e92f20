"""The PyTorch side's models: torchvision's where it imports, else the same architectures in plain torch.nn.

torchvision is the reference (its ResNet-50 is the one the studies and NVIDIA's figures train). A CPU
venv cannot always import it (the index's torchvision wheels are built for the CUDA torch), so the
ResNets (v1.5: the stride sits on the 3x3 convolution) and VGG-16 are written out here as torchvision
defines them, with its initialisation; tests check the parameter counts against torchvision's.
"""

from __future__ import annotations

# Parameter counts of torchvision's models with 1000 classes (torchvision.models docs, "num_params").
TORCHVISION_PARAMETERS = {"resnet50": 25_557_032, "resnet101": 44_549_160, "resnet152": 60_192_808,
                          "vgg16": 138_357_544}
# cnn_smoke: bench.cnn_smoke's network (a plumbing check, 38,136 weights), not a torchvision model.
MODELS = (*TORCHVISION_PARAMETERS, "cnn_smoke")
RESNET_BLOCKS = {"resnet50": (3, 4, 6, 3), "resnet101": (3, 4, 23, 3), "resnet152": (3, 8, 36, 3)}
VGG16_LAYERS = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def torchvision_version() -> str | None:
    """torchvision's version where it imports with working compiled ops, else None."""
    try:
        import torchvision

        torchvision.models.resnet50  # noqa: B018 (the import that fails when its ops do not fit this torch)
        return torchvision.__version__
    except Exception:  # ImportError, or RuntimeError "operator torchvision::nms does not exist"
        return None


def build(name: str, num_classes: int = 1000):
    """(model, where its definition came from)."""
    if name not in MODELS:
        raise ValueError(f"model {name!r}: the PyTorch side has {', '.join(MODELS)}")
    if name == "cnn_smoke":
        return cnn_smoke(num_classes), "containerbench.rank.torchmodels (cnn_smoke, as bench.py's)"
    version = torchvision_version()
    if version:
        import torchvision

        return getattr(torchvision.models, name)(weights=None, num_classes=num_classes), f"torchvision {version}"
    model = vgg16(num_classes) if name == "vgg16" else resnet(RESNET_BLOCKS[name], num_classes)
    return model, "containerbench.rank.torchmodels (torchvision's definition)"


def cnn_smoke(num_classes: int = 1000):
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes))


def resnet(blocks: tuple[int, ...], num_classes: int = 1000):
    from torch import nn

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inplanes: int, planes: int, stride: int, downsample):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            return self.relu(self.bn3(self.conv3(out)) + identity)

    def stage(inplanes: int, planes: int, count: int, stride: int):
        downsample = None
        if stride != 1 or inplanes != planes * 4:
            downsample = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(inplanes, planes, stride, downsample)]
        layers += [Bottleneck(planes * 4, planes, 1, None) for _ in range(count - 1)]
        return nn.Sequential(*layers)

    model = nn.Sequential(
        nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
        stage(64, 64, blocks[0], 1), stage(256, 128, blocks[1], 2),
        stage(512, 256, blocks[2], 2), stage(1024, 512, blocks[3], 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, num_classes),
    )
    for module in model.modules():  # torchvision's initialisation
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    return model


def vgg16(num_classes: int = 1000):
    from torch import nn

    layers, channels = [], 3
    for width in VGG16_LAYERS:
        if width == "M":
            layers.append(nn.MaxPool2d(2, stride=2))
        else:
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(inplace=True)]
            channels = width
    model = nn.Sequential(
        *layers, nn.AdaptiveAvgPool2d(7), nn.Flatten(),
        nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(),
        nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(), nn.Linear(4096, num_classes),
    )
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0, 0.01)
            nn.init.zeros_(module.bias)
    return model
