# Shared by the steps' verifiers: reward 1 when /app/log.txt holds exactly the lines given.
expect() {
  mkdir -p /logs/verifier
  if [ "$(cat /app/log.txt 2>/dev/null)" = "$(printf '%s\n' "$@")" ]; then r=1; else r=0; fi
  printf '{"reward": %s, "lines": %s}' "$r" "$(wc -l < /app/log.txt 2>/dev/null || echo 0)" > /logs/verifier/reward.json
}
