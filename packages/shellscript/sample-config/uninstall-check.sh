test ! -e /etc/motd.d/50-nodegate
