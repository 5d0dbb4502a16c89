# Test fixture: models in PFLlib's convention (classifier is `fc`, applied last).
import torch.nn as nn
import torch.nn.functional as F


class BaseHeadSplit(nn.Module):
    def __init__(self, base, head):
        super().__init__()
        self.base = base
        self.head = head

    def forward(self, x):
        return self.head(self.base(x))


class DNN(nn.Module):
    def __init__(self, input_dim=8, mid_dim=16, num_classes=3):
        super().__init__()
        self.fc1 = nn.Linear(input_dim, mid_dim)
        self.fc2 = nn.Linear(mid_dim, mid_dim)
        self.fc = nn.Linear(mid_dim, num_classes)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc(x)
