# The pool's clean reset: see CLEAN_SCRIPT in agentnest/pool.py for what it does and why.
# Run as: /bin/sh -c <this file> agentnest-clean <workdir>
W=$1
argv= code=
{ { IFS= read -r argv; IFS= read -r code; } < /proc/1/cmdline; } 2>/dev/null
case $argv/$code in
  python3-S-c/import\ sys) ;;
  *) echo "refused: PID 1 is not the AgentNest keeper, so this is not a sandbox"; exit 3 ;;
esac
me=$$
agent=$PPID
rounds=0
while :; do
  left=
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case $p in 1|"$me"|"$agent") ;; *) left="$left $p" ;; esac
  done
  [ -z "$left" ] && break
  rounds=$((rounds + 1))
  if [ "$rounds" -gt 100000 ]; then echo "processes survived SIGKILL"; exit 1; fi
  kill -9 $left 2>/dev/null
done
[ "$rounds" -gt 0 ] && echo killed
dirty() {
  [ -r "$1" ] && [ -w "$1" ] && [ -x "$1" ] || return 0
  for e in "$1"/.* "$1"/*; do
    case ${e##*/} in .|..) continue ;; esac
    if [ -e "$e" ] || [ -L "$e" ]; then return 0; fi
  done
  return 1
}
wipe() {
  [ -d "$1" ] || return 0
  dirty "$1" || return 0
  chmod -R u+rwx -- "$1" 2>/dev/null
  rm -rf -- "$1"/* "$1"/.[!.]* "$1"/..?* 2>/dev/null
  if dirty "$1"; then echo "could not empty $1"; exit 1; fi
}
[ -d "$W" ] || { echo "no workspace $W"; exit 1; }
wipe "$W"
[ -k /tmp ] || chmod 1777 /tmp
wipe /tmp
wipe /dev/shm
wipe /dev/mqueue
if [ -d /proc/sysvipc ] && ! ipcrm -a >/dev/null 2>&1; then
  # No ipcrm, or one without -a (busybox): fail only if objects are left.
  for f in /proc/sysvipc/shm /proc/sysvipc/sem /proc/sysvipc/msg; do
    n=0
    { while read -r l; do n=$((n + 1)); done < "$f"; } 2>/dev/null
    if [ "$n" -gt 1 ]; then echo "SysV IPC objects remain"; exit 1; fi
  done
fi
echo clean
