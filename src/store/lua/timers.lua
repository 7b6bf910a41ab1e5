-- Pop due timers and turn each into an internal event on the shard's events stream, in
-- one atomic call: whichever poller runs first gets a timer, and a popped timer is
-- always queued (never lost between the pop and the XADD).
--
-- KEYS[1] timers (zset, score = due unix ms)   KEYS[2] events stream
-- ARGV[1] now (unix ms)   ARGV[2] most timers to pop
-- Member format: <timer id> TAB <repo> TAB <event name> TAB <event JSON>. A member that
-- does not match is still queued, as an undecodable entry, so it reaches the dead
-- letters instead of vanishing.
-- Reply: the number of timers popped.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, m in ipairs(due) do
  redis.call('ZREM', KEYS[1], m)
  local id, repo, event, body = string.match(m, '^([^\t]*)\t([^\t]*)\t([^\t]*)\t(.*)$')
  if not id then
    id, repo, event, body = 'malformed', '', 'timer_fired', m
  end
  redis.call('XADD', KEYS[2], '*', 'kind', 'internal', 'delivery', 'timer:' .. id,
    'event', event, 'repo', repo, 'received', ARGV[1], 'body', body)
end
return #due
