"""Secure aggregation in simulation (Bonawitz et al., CCS 2017; SecAgg+ of Bell et al., CCS 2020):
the server learns the sum of the round's quantised updates and nothing else. Optional extra ``secagg``."""
