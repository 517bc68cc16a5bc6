"""The Flower ClientApp of the FedDB project."""
