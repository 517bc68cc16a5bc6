"""Framework-free core of the FedDB Flower app: data, partition, models, augmentation, losses,
DMA, local training and metrics. Nothing here imports Flower."""
