-- Pop due timers and turn each into an internal event on the shard's events stream, in
-- one atomic call: whichever poller runs first gets a timer, and a popped timer is
-- always queued (never lost between the pop and the XADD).
--
-- KEYS[1] timers (zset: member -> due unix ms)   KEYS[2] timer payloads (hash)
-- KEYS[3] events stream
-- ARGV[1] now (unix ms)   ARGV[2] most timers to pop
-- Payload format: <repo> TAB <event name> TAB <event JSON>. A timer whose payload is
-- missing or malformed is still queued, as an undecodable entry, so it reaches the
-- dead letters instead of vanishing.
-- The one script that writes the events-stream entry layout itself (the entry exists
-- only inside this call; why, and the layout: src/store/event_entry.rs). It writes the
-- fields of EventEntry::internal, in that order; keep the two in step.
-- Reply: the number of timers popped.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, m in ipairs(due) do
  local data = redis.call('HGET', KEYS[2], m)
  redis.call('ZREM', KEYS[1], m)
  redis.call('HDEL', KEYS[2], m)
  local repo, event, body
  if data then
    repo, event, body = string.match(data, '^([^\t]*)\t([^\t]*)\t(.*)$')
  end
  if not repo then
    repo, event, body = '', 'timer-malformed', tostring(data)
  end
  redis.call('XADD', KEYS[3], '*', 'kind', 'internal', 'delivery', 'timer:' .. m .. ':' .. ARGV[1],
    'event', event, 'repo', repo, 'received', ARGV[1], 'body', body)
end
return #due
