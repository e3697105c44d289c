"""`python -m shardflow.cluster.manifests [--check]`: regenerate (or check) the example manifests."""

import sys

from shardflow.cluster.manifests.examples import main

sys.exit(main())
