grep -qx "This node is managed by NodeGate." /etc/motd.d/50-nodegate
