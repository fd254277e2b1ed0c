"""Benchmarks (``harness bench ...``): speed and memory measured in fresh processes, next to
plain-PyTorch baselines, written as Markdown tables with the machine they ran on.

Modules (this package re-exports nothing)::

    attention  every attention variant's forward + backward throughput and peak memory
    cli        the ``harness bench`` command line
"""
