# Install a motd line (the sample of packages/shellscript).
mkdir -p /etc/motd.d
echo "This node is managed by NodeGate." > /etc/motd.d/50-nodegate
