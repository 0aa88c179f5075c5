"""The pure core: events in, ledgers out. No I/O, no clocks, no globals.

Imports only the standard library, numpy and pandas.
"""
