#!/bin/sh
# Entry point of the worker image: `shardflow ...` by default, so pods and Argo steps pass only
# shardflow's arguments; `dask ...` (dask-kubernetes, dask-jobqueue start workers this way),
# `python ...` and shells run as given.
case "$1" in
  dask|dask-worker|dask-scheduler|python|python3|sh|bash) exec "$@" ;;
  *) exec shardflow "$@" ;;
esac
