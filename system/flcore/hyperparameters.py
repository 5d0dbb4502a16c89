"""What each algorithm takes besides the common flags: one small frozen dataclass per algorithm, named
in its row of ``flcore/registry.py``. Each field reads one of PFLlib's shared flags (``-mu``, ``-lam``
...; :mod:`flcore.algorithm_flags`) under a name that says what it is for this algorithm, with the
values the algorithm accepts; they are checked once, when the run's flags are read. Algorithms that take
nothing use :class:`Hyperparameters` itself.

A field's ``default`` is the algorithm's own value for a flag the command line leaves out: its paper's
(or its authors' published commands'), cited beside it, where that value is known; the other fields
keep PFLlib's shared default. A flag given is used as given.
"""
from __future__ import annotations

from dataclasses import dataclass

from flcore.algorithm_flags import Hyperparameters, reads


# ----- layer split and personal heads -------------------------------------------------------------------
@dataclass(frozen=True)
class FedRepParams(Hyperparameters):
    head_epochs: int = reads("plocal_epochs", "FedRep's head epochs", minimum=0)


@dataclass(frozen=True)
class FedBABUParams(Hyperparameters):
    fine_tuning_epochs: int = reads("fine_tuning_epochs", "FedBABU's final fine-tuning epochs", minimum=0)


@dataclass(frozen=True)
class GPFLParams(Hyperparameters):
    # The authors' command for the 4-layer CNN and the MLP (TsingZ0/GPFL, system/run_me.sh: -lam 0.01 -mu 0.1).
    guidance_weight: float = reads("lamda", "GPFL's magnitude-guidance weight", minimum=0, default=0.01)
    weight_decay: float = reads("mu", "GPFL's weight decay on GCE and CoV", minimum=0, default=0.1)


@dataclass(frozen=True)
class FedCPParams(Hyperparameters):
    # The authors' command for the 4-layer CNN (TsingZ0/FedCP, system/run_me.sh: -lam 5).
    mmd_weight: float = reads("lamda", "FedCP's MMD weight", minimum=0, default=5)


@dataclass(frozen=True)
class FedDBEParams(Hyperparameters):
    # The authors' command (TsingZ0/DBE, system/run_me.sh: -mo 1 -klw 50); PFLlib's -klw 0 switches the mean
    # regulariser, half of the method, off.
    momentum: float = reads("momentum", "FedDBE's running-mean momentum", minimum=0, maximum=1, default=1)
    mean_weight: float = reads("kl_weight", "FedDBE's mean-regulariser weight", minimum=0, default=50)


@dataclass(frozen=True)
class FedGHParams(Hyperparameters):
    head_learning_rate: float = reads("server_learning_rate", "FedGH's global-head learning rate", above=0)


@dataclass(frozen=True)
class FedPACParams(Hyperparameters):
    alignment_weight: float = reads("lamda", "FedPAC's feature-alignment weight", minimum=0)


@dataclass(frozen=True)
class PFLDAParams(Hyperparameters):
    head_pull: float = reads("lamda", "PFL-DA's pull of the personal head towards the global one", minimum=0)


@dataclass(frozen=True)
class FedGCParams(Hyperparameters):
    # The server's step on the clients' class embeddings, W <- W - lamda * lr * grad Reg(W) (Niu and Deng, AAAI
    # 2022); PFLlib's -lam 1 makes it as large as a local step. 0 switches the correction off.
    server_step_scale: float = reads("lamda", "FedGC's server step on the class embeddings, in units of -lr",
                                     minimum=0)


# ----- regularised and full-model methods ---------------------------------------------------------------
@dataclass(frozen=True)
class FedProxParams(Hyperparameters):
    # PFLlib's -mu 0 is FedAvg. Li et al. (MLSys 2020, Sec. 5) pick mu per dataset from {0.001, 0.01, 0.1, 1};
    # 0.01 is their choice for a deep model (the Sent140 LSTM).
    prox_weight: float = reads("mu", "FedProx's proximal weight", minimum=0, default=0.01)


@dataclass(frozen=True)
class FedDynParams(Hyperparameters):
    regulariser_weight: float = reads("alpha", "FedDyn's regularisation weight; the server divides by it", above=0)


@dataclass(frozen=True)
class MOONParams(Hyperparameters):
    # PFLlib's -mu 0 is FedAvg. Li, He, Song (CVPR 2021, Sec. 4.1): mu 1 on CIFAR-100 and Tiny-ImageNet (5 on
    # CIFAR-10), temperature 0.5.
    contrastive_weight: float = reads("mu", "MOON's contrastive weight", minimum=0, default=1)
    temperature: float = reads("tau", "MOON's temperature", above=0, default=0.5)


@dataclass(frozen=True)
class SCAFFOLDParams(Hyperparameters):
    server_learning_rate: float = reads("server_learning_rate", "SCAFFOLD's global step size", above=0)


@dataclass(frozen=True)
class FedNTDParams(Hyperparameters):
    # PFLlib's -bt 0 is FedAvg. Lee et al. (NeurIPS 2022): beta 1, tau 1.
    distillation_weight: float = reads("beta", "FedNTD's distillation weight", minimum=0, default=1)
    temperature: float = reads("tau", "FedNTD's temperature", above=0, default=1)


@dataclass(frozen=True)
class FedLCParams(Hyperparameters):
    calibration_strength: float = reads("tau", "FedLC's calibration strength", minimum=0)


@dataclass(frozen=True)
class FedALAParams(Hyperparameters):
    weight_learning_rate: float = reads("eta", "FedALA's weight-learning rate", above=0)
    sample_percent: int = reads("rand_percent", "the percentage of local data FedALA learns its weights on",
                                above=0, maximum=100)
    # At most the model's parameter tensors: FedALA's server checks that once it has the model.
    mixed_tensors: int = reads("layer_idx", "the number of top parameter tensors FedALA mixes", minimum=1)


@dataclass(frozen=True)
class FedCACParams(Hyperparameters):
    # Wu et al. (ICCV 2023): tau 0.5, beta 170. PFLlib's -tau 1 marks every entry critical (every mask overlaps
    # fully, so FedCAC is a plain mean) and its -bt 0 is refused.
    critical_fraction: float = reads("tau", "the fraction of each tensor FedCAC treats as critical",
                                     above=0, maximum=1, default=0.5)
    threshold_rounds: float = reads("beta", "how fast FedCAC's collaboration threshold rises: it reaches the "
                                    "largest overlap after beta rounds", above=0, hint="the authors use e.g. -bt 170",
                                    default=170)


@dataclass(frozen=True)
class FedGenParams(Hyperparameters):
    # The authors' MNIST configuration (zhuangdizhu/FedGen, utils/model_config.py and servers/serverpFedGen.py):
    # noise 32, hidden 256, Adam at 3e-4, 50 generator steps a round (10 epochs of 5 teacher iterations).
    # PFLlib's: 512, 512, 0.005 and 1000.
    noise_dim: int = reads("noise_dim", "FedGen's noise width", minimum=1, default=32)
    hidden_dim: int = reads("hidden_dim", "FedGen's generator hidden width", minimum=1, default=256)
    generator_learning_rate: float = reads("generator_learning_rate", "FedGen's generator learning rate", above=0,
                                           default=3e-4)
    generator_steps: int = reads("server_epochs", "FedGen's generator steps per round; 0 never trains it, which "
                                 "leaves FedAvg", minimum=0, default=50)
    local_feature_extractor: bool = reads("localize_feature_extractor", "FedGen's local feature extractor")


@dataclass(frozen=True)
class FedCrossParams(Hyperparameters):
    # PFLlib's values: alpha 0.99 (where the paper's dynamic alpha ends) and the least similar collaborator (the
    # paper's choice; Hu et al., arXiv 2210.08285).
    first_stage_rounds: int = reads("first_stage_bound", "FedCross's FedAvg rounds before cross-aggregation",
                                    minimum=0)
    self_weight: float = reads("fedcross_alpha", "the weight a FedCross middleware model keeps of itself",
                               minimum=0, maximum=1)
    collaborator_strategy: int = reads("collaberative_model_select_strategy", "how FedCross picks a collaborator")


# ----- personalised copies --------------------------------------------------------------------------------
@dataclass(frozen=True)
class DittoParams(Hyperparameters):
    # PFLlib's -mu 0 is Local training. Li et al. (ICML 2021, Sec. 5) fix lambda = 1 outside strong attacks
    # (tuned over {0.1, 1, 2}).
    pull_weight: float = reads("mu", "Ditto's pull of the personal model towards the global one", minimum=0,
                               default=1)
    personal_epochs: int = reads("plocal_epochs", "Ditto's personal epochs per round", minimum=0)


@dataclass(frozen=True)
class APFLParams(Hyperparameters):
    initial_mixing: float = reads("alpha", "APFL's initial weight of the local model in the personalised mixture",
                                  minimum=0, maximum=1)


@dataclass(frozen=True)
class PFedMeParams(Hyperparameters):
    # PFLlib's shared default -bt 0 would keep the global model at its initial value forever. Dinh, Tran, Nguyen
    # (NeurIPS 2020, Sec. 5, the non-convex runs at -lr 0.005): beta 1, lambda 15, K 5, personal lr 0.09.
    server_mixing: float = reads("beta", "pFedMe's server step (1 - beta) * previous + beta * average", above=0,
                                 hint="the paper uses 1 or 2: try -bt 1", default=1)
    inner_steps: int = reads("K", "pFedMe's inner steps on the personalised model", minimum=1, default=5)
    personal_learning_rate: float = reads("p_learning_rate", "pFedMe's personal learning rate", above=0,
                                          default=0.09)
    moreau_weight: float = reads("lamda", "pFedMe's weight of ||theta - w||^2; with 0 the local model w never "
                                 "moves", above=0, default=15)


@dataclass(frozen=True)
class PerAvgParams(Hyperparameters):
    # PFLlib's -bt 0 would never move the model. beta 0.001 at -lr 0.005 is how Per-FedAvg (Fallah, Mokhtari,
    # Ozdaglar, NeurIPS 2020) is run in pFedMe's comparison (Dinh et al. 2020, Sec. 5) and in FedLAG's.
    meta_step_size: float = reads("beta", "PerAvg's meta step size; 0 would never move the model", above=0,
                                  hint="try the value of -lr", default=0.001)


@dataclass(frozen=True)
class FedPHPParams(Hyperparameters):
    # PFLlib's -lam 1 drops the cross-entropy (refused) and its -mu 0 inherits nothing. Li et al. (ECML-PKDD 2021)
    # and their code (lxcnju/FedRepo): lambda 0.05 to 0.1, mu 0.9.
    distillation_weight: float = reads("lamda", "FedPHP's MMD weight in (1 - lamda) * CE + lamda * MMD", minimum=0,
                                       below=1, hint="the authors use 0.05 to 0.1: try -lam 0.1", default=0.1)
    inheritance_ceiling: float = reads("mu", "FedPHP's largest weight of the inherited model in its moving "
                                       "average", minimum=0, below=1, hint="the authors use 0.9", default=0.9)


@dataclass(frozen=True)
class FedAMPParams(Hyperparameters):
    attention_step: float = reads("alphaK", "FedAMP's attention step size", above=0)
    kernel_width: float = reads("sigma", "FedAMP's kernel width", above=0)
    proximal_weight: float = reads("lamda", "FedAMP's proximal weight", minimum=0)


@dataclass(frozen=True)
class FedFomoParams(Hyperparameters):
    models_per_client: int = reads("M", "the number of models each FedFomo client downloads", minimum=1)


@dataclass(frozen=True)
class FedMTLParams(Hyperparameters):
    relationship_weight: float = reads("lamda", "FedMTL's weight of the task-relationship regulariser", minimum=0)
    # PFLlib's clientmtl.py stores -itk and never reads it again; kept so that -itk is FedMTL's flag.
    itk: int = reads("itk", "FedMTL's itk, unused as in PFLlib")


@dataclass(frozen=True)
class APPLEParams(Hyperparameters):
    # PFLlib's -dlr 0 never moves the relationships and its -mu 0 drops their pull towards p0, so APPLE would be a
    # fixed sample-weighted mixture. The authors' code (ljaiverson/pFL-APPLE, utils/utils.py): lr_coef 0.001, mu 0.1.
    relationship_learning_rate: float = reads("dr_learning_rate", "APPLE's learning rate of the directed "
                                              "relationships; 0 keeps them at p0", minimum=0, default=0.001)
    relationship_pull: float = reads("mu", "APPLE's weight of the pull of the relationships towards p0", minimum=0,
                                     default=0.1)
    pull_fraction: float = reads("L", "the fraction of -gr over which APPLE's pull towards p0 fades", minimum=0,
                                 maximum=1)


@dataclass(frozen=True)
class FMLParams(Hyperparameters):
    # PFLlib's -al 1 leaves the local model, which FML reports, out of the mutual learning (Local training), and
    # its -bt 0 trains the meme model on the local model's predictions alone. Shen et al. (2020, arXiv
    # 2006.16765) weigh cross-entropy and distillation equally in both losses: alpha = beta = 0.5.
    local_ce_weight: float = reads("alpha", "FML's weight of cross-entropy in the local model's loss (the rest "
                                   "distils from the meme model)", minimum=0, maximum=1, default=0.5)
    meme_ce_weight: float = reads("beta", "FML's weight of cross-entropy in the meme model's loss (the rest "
                                  "distils from the local model)", minimum=0, maximum=1, default=0.5)


@dataclass(frozen=True)
class FedKDParams(Hyperparameters):
    # PFLlib's values are the paper's (Wu et al., Nature Communications 2022: T from 0.95 to 0.98); the paper
    # trains mentor and mentee at one learning rate, as -mlr 0.005 does at PFLlib's -lr 0.005.
    mentee_learning_rate: float = reads("mentee_learning_rate", "FedKD's learning rate of the shared mentee",
                                        above=0)
    energy_start: float = reads("T_start", "the share of an update's energy FedKD keeps in round 0", above=0,
                                maximum=1)
    energy_end: float = reads("T_end", "the share of an update's energy FedKD keeps in the last round", above=0,
                              maximum=1)


# ----- clustered ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IFCAParams(Hyperparameters):
    num_clusters: int = reads("num_clusters", "IFCA's number of cluster models", minimum=1)
    share_base: bool = reads("ifca_share_base", "IFCA's weight sharing across clusters")


@dataclass(frozen=True)
class CFLParams(Hyperparameters):
    read_only_when = {"cfl_ratio": ("cfl_rule", "relative"), "cfl_eps1": ("cfl_rule", "absolute"),
                      "cfl_eps2": ("cfl_rule", "absolute")}
    rule: str = reads("cfl_rule", "CFL's split rule")
    mean_to_orthogonal_below: float = reads("cfl_ratio", "CFL's relative split bound", above=0, maximum=1)
    mean_norm_below: float = reads("cfl_eps1", "CFL's eps1, the bound on the norm of a cluster's mean update",
                                   above=0)
    max_norm_above: float = reads("cfl_eps2", "CFL's eps2, the bound on the largest client update norm",
                                  minimum=0)
    warmup_rounds: int = reads("cfl_warmup", "CFL's rounds without a split", minimum=0)
    linkage: str = reads("cfl_linkage", "CFL's bipartition linkage")


# ----- knowledge sharing ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FedProtoParams(Hyperparameters):
    prototype_weight: float = reads("lamda", "FedProto's prototype-regulariser weight")


@dataclass(frozen=True)
class FDParams(Hyperparameters):
    distillation_weight: float = reads("lamda", "FD's distillation weight")


@dataclass(frozen=True)
class FedPCLParams(Hyperparameters):
    # The authors' temperature (yuetan031/FedPCL, lib/update.py: ConLoss(temperature=0.07)); PFLlib's -tau 1 makes
    # every cosine similarity count about alike.
    temperature: float = reads("tau", "FedPCL's temperature", above=0, default=0.07)
