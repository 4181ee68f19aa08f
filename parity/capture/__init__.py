"""Capture: run one training step in one framework and stream every tensor to a run directory.

Each framework runs in its own process (``parity capture --framework ...``) so their native
libraries never share an address space; ``common`` holds what both sides share.
"""
