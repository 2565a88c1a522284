-- Puts dead-lettered jobs back, with their attempts reset.
-- KEYS[1] <prefix>ready  KEYS[2] <prefix>dead  KEYS[3] <prefix>dead:info  KEYS[4] <prefix>ids
-- KEYS[5] <prefix>paused  KEYS[6] <prefix>parked  KEYS[7] <prefix>stats  KEYS[8] <prefix>jumped
-- ARGV[1] 'tail' (behind the group's pending jobs, or the ready list's) or 'head' (next in its
--   group: after the job at the group's head, which may be running, or, when that head's group
--   runs several at once, in front of it, since its running jobs are out of the list (claim.lua);
--   ungrouped: the ready list's head), then the dead letters' keys (the job id, or
--   '<id>#<fence>': see finish.lua)
-- Several jobs to a head keep the order given (so a caller sends them in one call).
-- A job put behind a group's head (which may be running a burst: see finish.lua) adds the group
-- to jumped, so that the burst's keeps put their followers back in front of it.
-- Returns: the keys requeued (a key not dead-lettered, or whose job's producer-given id a pending
-- job has taken meanwhile, is left where it is).
local ready, dead, dead_info, ids, paused, parked = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local prefix = string.sub(ready, 1, -6)
--@levels
-- (On a cluster, while the queue's slot migrates: wait, before any write. See PROTOCOL.md.)
-- (The probe key never exists: the call also asks for the levels' mark.)
local probe = redis.pcall('EXISTS', prefix .. 'probe', levels_mark)
if type(probe) == 'table' then return redis.error_reply(string.find(probe.err, 'non local', 1, true) and 'TRYAGAIN slot migrating' or probe.err) end
grouped_levels = probe > 0
local at_head = ARGV[1] == 'head'

-- A record joins its group at the tail; a group that had no jobs gets its lane (or is parked).
local function join(group, record)
  if redis.call('RPUSH', prefix .. 'g:' .. group, record) == 1 then
    redis.call('HINCRBY', KEYS[7], 'groups', 1)
    if redis.call('HEXISTS', paused, group) == 1 then
      redis.call('SADD', parked, group)
    else
      push_lanes({'g:' .. group})
    end
  end
end

local out = {}
local front, heads, head_groups = {}, {}, {} -- for the heads, in the order given
for i = 2, #ARGV do
  local key = ARGV[i]
  local info = redis.call('HGET', dead_info, key)
  local ok, letter = pcall(cjson.decode, info or '')
  if ok and type(letter) == 'table' and type(letter.record) == 'string' and
      (letter.group == nil or type(letter.group) == 'string') then
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
        if at_head then front[#front + 1] = 'j:' .. record else push_lanes({'j:' .. record}) end
      elseif at_head then
        local list = heads[group]
        if not list then
          list = {}
          heads[group] = list
          head_groups[#head_groups + 1] = group
        end
        list[#list + 1] = record
      else
        join(group, record)
      end
      redis.call('ZREM', dead, key)
      redis.call('HDEL', dead_info, key)
      if id and string.find(body, '^{"keep":%d') then -- kept in the index again (see enqueue.lua)
        redis.call('HSET', prefix .. 'jobs', id, string.format('p0:%d:', #group) .. group .. record)
      end
      out[#out + 1] = key
    end
  end
end
push_lanes(front, true)
-- A group's records go to its head as one block, the last pushed first: behind the head, which
-- comes off and goes back on top, or, when the head's group runs several at once (its head is
-- the next to start), in front of it. One push per record, wherever they land.
for _, group in ipairs(head_groups) do
  local key, records = prefix .. 'g:' .. group, heads[group]
  local head = redis.call('LINDEX', key, 0)
  if not head then
    for _, record in ipairs(records) do join(group, record) end
  elseif conc_of(head) > 1 then -- (runs several at once: see levels)
    for i = #records, 1, -1 do redis.call('LPUSH', key, records[i]) end
  else
    redis.call('LPOP', key)
    for i = #records, 1, -1 do redis.call('LPUSH', key, records[i]) end
    redis.call('LPUSH', key, head)
    redis.call('SADD', KEYS[8], group)
  end
end
return out
