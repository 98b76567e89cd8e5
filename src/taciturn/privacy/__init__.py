"""Client-level differential privacy (DP-FedAvg, McMahan et al., ICLR 2018): clipped client
updates, Gaussian noise, and the privacy spent, from ``dp-accounting`` (optional extra ``dp``)."""
