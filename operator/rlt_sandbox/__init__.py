"""The local preview and test machinery: an emulated Kubernetes API (kmock) with the operator attached, a kubelet
emulator that runs pods as local processes, and `rlt sandbox`. Never shipped in the operator image; rlt_operator
imports nothing from here."""
