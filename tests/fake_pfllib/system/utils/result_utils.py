# Test fixture: average_data reads ../results/<dataset>_<algorithm>_<goal>_<i>.h5 for every run.
import h5py
import numpy as np


def average_data(algorithm="", dataset="", goal="", times=10):
    best = []
    for i in range(times):
        file_path = f"../results/{dataset}_{algorithm}_{goal}_{i}.h5"
        with h5py.File(file_path, "r") as hf:
            best.append(float(np.max(np.array(hf["rs_test_acc"]))))
    print(f"Average best accuracy of {algorithm}: {np.mean(best):.4f} (std {np.std(best):.4f})")
