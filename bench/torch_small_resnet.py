"""dtrain's resnet:small in PyTorch without torchvision: torchvision's BasicBlock ResNet (a 3x3 stem of 16 channels,
stages of two blocks of 16, 32 and 64 channels, the head) under torchvision's parameter names and order, so that
dtrain's initialisation (scripts/dtrain_random.py's resnet_init) and its state dicts carry over. Used by
bench/torch_compress_resnet.py and scripts/make_kfac_fixture.py."""
import torch


class Block(torch.nn.Module):
    """torchvision's BasicBlock under its names: two 3x3 convolutions with BatchNorm, a 1x1 projection (downsample)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        nn = torch.nn
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (self.downsample(x) if self.downsample is not None else x))


class SmallResNet(torch.nn.Module):
    """dtrain's resnet:small: a 3x3 stem, three stages of two blocks (16, 32, 64 channels), the head."""

    def __init__(self, classes):
        super().__init__()
        nn = torch.nn
        self.conv1 = nn.Conv2d(1, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        cin = 16
        for i, (cout, stride) in enumerate(((16, 1), (32, 2), (64, 2))):
            setattr(self, f"layer{i + 1}", nn.Sequential(Block(cin, cout, stride), Block(cout, cout, 1)))
            cin = cout
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))
