# NCCL settings per node (haap; Holmes-style per-NIC transports). Source with HAAP_NODE set.
# Interface/HCA names are hints: check `ibv_devices` and `ip link` on your nodes.
case "${HAAP_NODE:?}" in
  # ib-h100-h100-80g-g0-n0: h100-80g on island ib-h100, NIC ib -> Socket (pipeline neighbour roce-v100-v100-32g-g1-n0 is not reachable by IB verbs; stock NCCL uses one network per process, so this node's data-parallel traffic uses TCP too)
  ib-h100-h100-80g-g0-n0) export NCCL_IB_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=eth0 ;;
  # roce-v100-v100-32g-g1-n0: v100-32g on island roce-v100, NIC roce -> Socket (pipeline neighbour ib-h100-h100-80g-g0-n0 is not reachable by IB verbs; stock NCCL uses one network per process, so this node's data-parallel traffic uses TCP too)
  roce-v100-v100-32g-g1-n0) export NCCL_IB_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=eth0 ;;
  # roce-v100-v100-32g-g1-n1: v100-32g on island roce-v100, NIC roce -> Socket (pipeline neighbour eth-v100-v100-32g-g2-n0 is not reachable by IB verbs; stock NCCL uses one network per process, so this node's data-parallel traffic uses TCP too)
  roce-v100-v100-32g-g1-n1) export NCCL_IB_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=eth0 ;;
  # eth-v100-v100-32g-g2-n0: v100-32g on island eth-v100, NIC ethernet -> Socket (Ethernet NIC)
  eth-v100-v100-32g-g2-n0) export NCCL_IB_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=eth0 ;;
esac
