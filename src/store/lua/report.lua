-- Accept one work result (results API or results stream): the work id must be active,
-- and only its first report is queued, as an internal event on the shard's events
-- stream.
--
-- KEYS[1] work index (hash)   KEYS[2] ended marker of the id   KEYS[3] reported marker
-- KEYS[4] events stream
-- ARGV[1] work id   ARGV[2] marker TTL (seconds)   ARGV[3..] fields of the events entry
-- Reply: {'queued', <stream id>} | {'unknown'} | {'ended'} | {'reported'}
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  if redis.call('EXISTS', KEYS[2]) == 1 then
    return {'ended'}
  end
  return {'unknown'}
end
if not redis.call('SET', KEYS[3], '1', 'NX', 'EX', ARGV[2]) then
  return {'reported'}
end
local id = redis.call('XADD', KEYS[4], '*', unpack(ARGV, 3))
return {'queued', id}
