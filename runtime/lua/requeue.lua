-- Puts dead-lettered jobs back, with their attempts reset.
-- KEYS[1] <prefix>ready  KEYS[2] <prefix>dead  KEYS[3] <prefix>dead:info  KEYS[4] <prefix>ids
-- KEYS[5] <prefix>paused  KEYS[6] <prefix>parked  KEYS[7] <prefix>stats  KEYS[8] <prefix>jumped
-- ARGV[1] 'tail' (behind the group's pending jobs, or the ready list's) or 'head' (next in its
--   group, after the job at the group's head, which may be running; ungrouped: the ready list's
--   head), then the dead letters' keys (the job id, or '<id>#<fence>': see finish.lua)
-- A job put behind a group's head (which may be running a burst: see finish.lua) adds the group
-- to jumped, so that the burst's keeps put their followers back in front of it.
-- Returns: the keys requeued (a key not dead-lettered, or whose job's producer-given id a pending
-- job has taken meanwhile, is left where it is).
local ready, dead, dead_info, ids, paused, parked = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local prefix = string.sub(ready, 1, -6)
local at_head = ARGV[1] == 'head'
-- Several jobs to a head go there in the order given: ungrouped ones are pushed at the end, the
-- last first; a group's each go behind the one before (after[group]), the first behind the head.
local out, front, after = {}, {}, {}
for i = 2, #ARGV do
  local key = ARGV[i]
  local info = redis.call('HGET', dead_info, key)
  local ok, letter = pcall(cjson.decode, info or '')
  if ok and type(letter) == 'table' and type(letter.record) == 'string' then
    local rest = string.match(letter.record, '^%d+(|.*)$')
    local record = letter.record
    if rest then record = '0' .. rest end
    local id, body = string.match(record, '^%d+|([^|]*)|(.*)$')
    local decoded_ok, decoded = pcall(cjson.decode, body or '')
    local free = true
    -- the producer's id (not all digits, or flagged "u" by an older producer) is taken again
    if id and (string.find(id, '%D') or (decoded_ok and type(decoded) == 'table' and decoded.u)) then
      free = redis.call('SADD', ids, id) == 1
    end
    if free then
      local group = letter.group or ''
      if group == '' then
        if at_head then front[#front + 1] = 'j:' .. record else redis.call('RPUSH', ready, 'j:' .. record) end
      else
        local key = prefix .. 'g:' .. group
        local pivot = at_head and (after[group] or redis.call('LINDEX', key, 0))
        if at_head then after[group] = record end
        if pivot then
          redis.call('LINSERT', key, 'AFTER', pivot, record)
          redis.call('SADD', KEYS[8], group)
        elseif redis.call('RPUSH', key, record) == 1 then
          redis.call('HINCRBY', KEYS[7], 'groups', 1)
          if redis.call('HEXISTS', paused, group) == 1 then
            redis.call('SADD', parked, group)
          else
            redis.call('RPUSH', ready, 'g:' .. group)
          end
        end
      end
      redis.call('ZREM', dead, key)
      redis.call('HDEL', dead_info, key)
      out[#out + 1] = key
    end
  end
end
for i = #front, 1, -1 do redis.call('LPUSH', ready, front[i]) end
return out
