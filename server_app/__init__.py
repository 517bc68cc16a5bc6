"""The Flower ServerApp of the FedDB project."""
