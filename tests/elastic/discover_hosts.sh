#!/usr/bin/env bash
# A host discovery script for the respawn test (GYRE_ELASTIC_HOST_DISCOVERY_SCRIPT):
# this host with 3 slots, as Horovod's --host-discovery-script prints them.
echo "# host:slots"
echo "$(hostname):3"
