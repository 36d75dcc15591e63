#!/bin/sh
# The first thing a NodeGate dev real node runs, as PID 1 of its new mount, UTS, PID and network
# namespaces, still on this machine's file system (gate/devcluster/realnode.py starts it under
# `unshare`). It assembles the node's own root and moves into it, like an initramfs would:
#
#   overlay of the cached Debian root (read-only) and this node's writable layer  -> the node's /
#   this node's containerd and kubelet directories (overlayfs cannot host their layers)
#   a /proc of its own PID namespace, a /sys of its own network namespace, the shared cgroups
#   a boot ID of its own (the kernel is shared, so its boot_id would not change on a reboot)
#
# then pivot_root into it and exec the node's init. Every mount lives in the node's mount
# namespace and goes when the node does. Settings come from the environment (NODE_*).
set -eu
root=$NODE_DIR/root
hostname "$NODE_NAME"
mount --make-rprivate /
mkdir -p "$root" "$NODE_DIR/upper" "$NODE_DIR/work" "$NODE_DIR/containerd" "$NODE_DIR/kubelet" "$NODE_DIR/pods-log"
mount -t overlay overlay -o "lowerdir=$NODE_LOWER,upperdir=$NODE_DIR/upper,workdir=$NODE_DIR/work" "$root"
mkdir -p "$root/var/lib/containerd" "$root/var/lib/kubelet" "$root/var/log/pods"
mount --bind "$NODE_DIR/containerd" "$root/var/lib/containerd"
mount --bind "$NODE_DIR/kubelet" "$root/var/lib/kubelet"
mount --bind "$NODE_DIR/pods-log" "$root/var/log/pods"
mount -t proc proc "$root/proc"
mount --bind "$NODE_DIR/boot_id" "$root/proc/sys/kernel/random/boot_id"
mount -t sysfs sysfs "$root/sys"
mount --rbind /sys/fs/cgroup "$root/sys/fs/cgroup"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o mode=755 tmpfs "$root/run"
mkdir -p "$root/usr/local/bin"
touch "$root/usr/local/bin/kubelet"
mount --bind "$NODE_KUBELET" "$root/usr/local/bin/kubelet"

# The machine's side plugs this node's eth0 in after unshare started us; wait for its address.
i=0
until ip -4 -o addr show dev eth0 2>/dev/null | grep -q inet; do
    i=$((i + 1))
    [ "$i" -lt 300 ] || { echo "prepare: eth0 got no address in 30s" >&2; exit 1; }
    sleep 0.1
done

mkdir -p "$root/.oldroot"
cd "$root"
pivot_root . .oldroot
umount -l /.oldroot
rmdir /.oldroot
exec /usr/libexec/nodegate-node/init /usr/libexec/nodegate-node/boot
