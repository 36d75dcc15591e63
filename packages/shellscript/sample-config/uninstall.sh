rm -f /etc/motd.d/50-nodegate
