#!/bin/sh
#
# keepalived notify script for a pair of XDP routers in offload mode, after
# conntrack-tools' doc/sync/primary-backup.sh (Pablo Neira Ayuso): what
# conntrackd must do on each VRRP state change.
#
#   primary  this router now owns the virtual addresses: commit the
#            external cache (the peer's connections, received over the sync
#            link) into the kernel's conntrack table, then start over as the
#            source of truth (flush both caches, refill the internal cache
#            from the kernel, send it all to the peer). The committed
#            connections reach the kernel as NEW conntrack events, so
#            `router-ctl run` offloads them into XDP like any other
#            established flow (UDP and ICMP once this router forwarded one
#            of their replies): nothing XDP-specific happens here.
#   backup   shorten the kernel timers of the connections this router
#            carried (zombies once the peer is master) and ask the master
#            for a full resync of its table.
#   fault    a tracked link is down: shorten the timers as for backup.
#
# Usage (keepalived.conf, vrrp_sync_group):
#   notify_master "/etc/conntrackd/primary-backup.sh primary"
# Environment (optional): CONNTRACKD_CONFIG (default
# /etc/conntrackd/conntrackd.conf), CONNTRACKD_BIN, NOTIFY_LOG (a file that
# gets one "UNIX_TIME EVENT" line per step; the failover test reads it).
#
# Unlike the upstream script, backup does not start a dead conntrackd:
# leave that to its service manager (systemd Restart=, or the test).

CONNTRACKD_BIN=${CONNTRACKD_BIN:-/usr/sbin/conntrackd}
CONNTRACKD_CONFIG=${CONNTRACKD_CONFIG:-/etc/conntrackd/conntrackd.conf}

note() {
    if [ -n "$NOTIFY_LOG" ]; then
        echo "$(date +%s.%N) $*" >> "$NOTIFY_LOG"
    fi
}

ctl() {
    if ! "$CONNTRACKD_BIN" -C "$CONNTRACKD_CONFIG" "$@"; then
        logger -t primary-backup "ERROR: conntrackd $* failed" 2>/dev/null
        note "error conntrackd $*"
    fi
}

case "$1" in
  primary)
    note primary-begin
    ctl -c   # commit the external cache into the kernel table
    ctl -f   # flush the internal and the external caches
    ctl -R   # resynchronise the internal cache with the kernel table
    ctl -B   # send a bulk update to the backup
    note primary-committed
    ;;
  backup)
    note backup-begin
    ctl -t   # purge zombie entries: conntrackd 1.4 flushes the kernel table after PurgeTimeout
    ctl -n   # request a resync from the master
    note backup-done
    ;;
  fault)
    note fault-begin
    ctl -t
    note fault-done
    ;;
  *)
    echo "usage: primary-backup.sh {primary|backup|fault}" >&2
    exit 1
    ;;
esac
exit 0
