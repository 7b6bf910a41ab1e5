-- Finish one effects-stream entry atomically: queue the internal events the effect
-- produced (observations, outcomes) on the shard's events stream, set the effect's
-- done marker, and acknowledge the entry. The done marker makes it idempotent: when
-- the effect is already done (a reclaimed duplicate finished first), nothing is queued
-- again and the entry is only acknowledged.
--
-- KEYS[1] effects stream   KEYS[2] events stream   KEYS[3] done marker of the effect
-- ARGV[1] consumer group   ARGV[2] entry id   ARGV[3] done-marker TTL in milliseconds
-- ARGV[4] number of events, then for each event: the number m of its arguments, then
--         its m field/value arguments (the events-stream entry, laid out by
--         store::event_entry; this script only splices them)
--
-- Reply: 1 when the events were queued, 0 when the effect was already done.
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
  return 0
end
local n = tonumber(ARGV[4])
local at = 5
for _ = 1, n do
  local m = tonumber(ARGV[at])
  redis.call('XADD', KEYS[2], '*', unpack(ARGV, at + 1, at + m))
  at = at + m + 1
end
redis.call('SET', KEYS[3], '1', 'PX', ARGV[3])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return 1
