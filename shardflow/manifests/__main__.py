"""`python -m shardflow.manifests` (0.1.0 spelling): see `shardflow.cluster.manifests`."""

import sys

from shardflow.cluster.manifests.examples import main

sys.exit(main())
