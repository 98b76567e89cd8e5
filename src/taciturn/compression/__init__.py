"""Compression of messages on the uplink and the downlink: compressors, chains with error feedback
or a reference, and their config (``[compression]``)."""
