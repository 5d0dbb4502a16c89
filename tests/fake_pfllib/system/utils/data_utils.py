# Test fixture: per-client data read from ../dataset/<dataset>/{train,test}/<idx>.npz (x, y).
import os

import numpy as np
import torch


def read_data(dataset, idx, is_train=True):
    folder = os.path.join("..", "dataset", dataset, "train" if is_train else "test")
    with np.load(os.path.join(folder, f"{idx}.npz")) as f:
        return {"x": f["x"], "y": f["y"]}


def read_client_data(dataset, idx, is_train=True):
    data = read_data(dataset, idx, is_train)
    x = torch.tensor(data["x"], dtype=torch.float32)
    y = torch.tensor(data["y"], dtype=torch.int64)
    return [(xi, yi) for xi, yi in zip(x, y)]
