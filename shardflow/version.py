"""The package version, in a module of its own at the bottom of the layers.

Run records (job.json), the Dask version check and the cluster's version guard all write or compare
`__version__`; reading it from `shardflow` itself would import the package's front door (and, through
its lazy names, possibly the layers above) from inside those layers. This module imports nothing.
"""

__version__ = "0.1.0"
