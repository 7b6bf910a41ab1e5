-- Commit one transition (or several, for an event applied to every open PR of a
-- repository) atomically: compare-and-set on each record version, write the records,
-- their history entries and the repository index, append the effects, schedule the
-- timers, maintain the work index, and acknowledge the events entry that caused it.
--
-- KEYS[1] events stream        KEYS[2] effects stream
-- KEYS[3] timers (zset)        KEYS[4] work index (hash: work id -> owner)
-- KEYS[5] timer payloads (hash)
-- KEYS[B+3i-2], KEYS[B+3i-1], KEYS[B+3i] with B = 5: record i, its history stream, its
--   repo index
-- KEYS[B+3n+j]: ended-work marker of plan.work_end[j] ('1', or the owner of a work id in
--   plan.superseded)
-- ARGV[1]: the plan as JSON (every scalar a string; see commit.rs)
--
-- Replies: {'ok'} | {'conflict', <record index from 0>, <current version>} |
--          {'stale'} when the entry is no longer pending (another consumer committed it).
local plan = cjson.decode(ARGV[1])
local B = 5
local n = #plan.records

-- 1. The entry must still be pending in the group: if another consumer that reclaimed
--    it has committed (and acked) it meanwhile, committing again would apply it twice.
if plan.entry_id ~= '' then
  local p = redis.call('XPENDING', KEYS[1], plan.group, plan.entry_id, plan.entry_id, 1)
  if #p == 0 then
    return {'stale'}
  end
end

-- 2. Compare-and-set on every record version before writing anything.
for i, r in ipairs(plan.records) do
  local v = redis.call('HGET', KEYS[B + 3 * i - 2], 'v')
  if not v then
    v = '0'
  end
  if v ~= r.expect then
    return {'conflict', tostring(i - 1), v}
  end
end

-- 3. Writes. A record with write = '0' was only checked (its transition changed
--    nothing); a record with an empty history gets no history entry (a repository-wide
--    event that did not concern it).
for i, r in ipairs(plan.records) do
  local rec, hist, index = KEYS[B + 3 * i - 2], KEYS[B + 3 * i - 1], KEYS[B + 3 * i]
  if r.write == '1' then
    redis.call('HSET', rec, 'v', r.version, 'data', r.data, 'phase', r.phase)
  end
  if #r.history > 0 then
    redis.call('XADD', hist, 'MAXLEN', '~', plan.history_max, '*', unpack(r.history))
  end
  if r.indexed == '1' then
    redis.call('SADD', index, rec)
  else
    redis.call('SREM', index, rec)
  end
end
for _, e in ipairs(plan.effects) do
  redis.call('XADD', KEYS[2], '*', unpack(e))
end
for _, t in ipairs(plan.timers) do
  redis.call('ZADD', KEYS[3], t[1], t[2])
  redis.call('HSET', KEYS[5], t[2], t[3])
end
for _, w in ipairs(plan.work_add) do
  redis.call('HSET', KEYS[4], w[1], w[2])
end
-- The ended marker is '1', or the owner when the agent's own push superseded the claim
-- (report.lua still accepts that agent's result, once).
for j, id in ipairs(plan.work_end) do
  redis.call('HDEL', KEYS[4], id)
  local marker = plan.superseded[id] or '1'
  redis.call('SET', KEYS[B + 3 * n + j], marker, 'EX', plan.ended_ttl)
end
if plan.entry_id ~= '' then
  redis.call('XACK', KEYS[1], plan.group, plan.entry_id)
end
return {'ok'}
