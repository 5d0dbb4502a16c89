#!/usr/bin/env python
# Test fixture: a small main.py in the shape of PFLlib's (argparse, run(args), if/elif dispatch).
import argparse
import copy
import random
import time
import warnings

import numpy as np
import torch
import torch.nn as nn

from flcore.servers.serveravg import FedAvg
from flcore.servers.serverrep import FedRep
from flcore.trainmodel.models import DNN, BaseHeadSplit
from utils.result_utils import average_data

warnings.simplefilter("ignore")
torch.manual_seed(0)
# Test-only: upstream leaves client sampling unseeded; fixed here so that every test run samples the same
# clients (with some samplings no tensor conflicts in the last round, and nothing is personal).
np.random.seed(0)
random.seed(0)


def run(args):
    time_list = []
    model_str = args.model

    for i in range(args.prev, args.times):
        print(f"\n============= Running time: {i}th =============")
        print("Creating server and clients ...")
        start = time.time()

        # Generate args.model
        if model_str == "DNN":
            args.model = DNN(8, 16, num_classes=args.num_classes).to(args.device)
        else:
            raise NotImplementedError

        print(args.model)

        # select algorithm
        if args.algorithm == "FedAvg":
            args.head = copy.deepcopy(args.model.fc)
            args.model.fc = nn.Identity()
            args.model = BaseHeadSplit(args.model, args.head)
            server = FedAvg(args, i)

        elif args.algorithm == "FedRep":
            args.head = copy.deepcopy(args.model.fc)
            args.model.fc = nn.Identity()
            args.model = BaseHeadSplit(args.model, args.head)
            server = FedRep(args, i)

        else:
            raise NotImplementedError

        server.train()

        time_list.append(time.time() - start)

    print(f"\nAverage time cost: {round(np.average(time_list), 2)}s.")

    # Global average
    average_data(dataset=args.dataset, algorithm=args.algorithm, goal=args.goal, times=args.times)

    print("All done!")


if __name__ == "__main__":
    total_start = time.time()

    parser = argparse.ArgumentParser()
    # general
    parser.add_argument('-go', "--goal", type=str, default="test",
                        help="The goal for this experiment")
    parser.add_argument('-dev', "--device", type=str, default="cuda",
                        choices=["cpu", "cuda"])
    parser.add_argument('-did', "--device_id", type=str, default="0")
    parser.add_argument('-data', "--dataset", type=str, default="Tiny")
    parser.add_argument('-ncl', "--num_classes", type=int, default=3)
    parser.add_argument('-m', "--model", type=str, default="DNN")
    parser.add_argument('-lbs', "--batch_size", type=int, default=8)
    parser.add_argument('-lr', "--local_learning_rate", type=float, default=0.005,
                        help="Local learning rate")
    parser.add_argument('-gr', "--global_rounds", type=int, default=2000)
    parser.add_argument('-ls', "--local_epochs", type=int, default=1)
    parser.add_argument('-algo', "--algorithm", type=str, default="FedAvg")
    parser.add_argument('-jr', "--join_ratio", type=float, default=1,
                        help="Ratio of clients per round")
    parser.add_argument('-nc', "--num_clients", type=int, default=4,
                        help="Total number of clients")
    parser.add_argument('-pv', "--prev", type=int, default=0)
    parser.add_argument('-t', "--times", type=int, default=1, help="Running times")
    parser.add_argument('-eg', "--eval_gap", type=int, default=1)
    parser.add_argument('-cdr', "--client_drop_rate", type=float, default=0.0)
    parser.add_argument('-tth', "--time_threthold", type=float, default=10000)
    # FedRep
    parser.add_argument('-pls', "--plocal_epochs", type=int, default=1)

    args = parser.parse_args()

    if args.device == "cuda" and not torch.cuda.is_available():
        print("\ncuda is not avaiable.\n")
        args.device = "cpu"

    print("=" * 50)
    for arg in vars(args):
        print(arg, '=', getattr(args, arg))
    print("=" * 50)

    run(args)

    print(f"\nTotal time cost: {round(time.time() - total_start, 2)}s.")
