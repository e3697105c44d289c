"""Alias kept for 0.1.0 users: the manifest generators live in `shardflow.cluster.manifests`."""

from shardflow.cluster.manifests import *  # noqa: F401,F403
from shardflow.cluster.manifests import render, render_options  # noqa: F401
