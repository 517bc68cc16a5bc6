"""Framework-free core of the FedDB Flower app: data, partition, models, augmentation, losses,
DMA, local training and metrics. Nothing here imports Flower."""

import os

# MKL's strict reproducibility mode: its matrix products (Linear layers) give the same bits on
# any number of threads (on 2 threads a Linear 3136->128 differed from one thread's by 1e-4).
# MKL reads it at its first call, which comes after this import in every process of the
# project; a value the user set wins. fssl.models.Conv2d does the same for convolutions.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
