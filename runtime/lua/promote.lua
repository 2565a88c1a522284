-- Moves due entries of delayed to where they belong, oldest first, at most max of them.
-- KEYS[1] <prefix>ready  KEYS[2] <prefix>delayed  KEYS[3] <prefix>paused  KEYS[4] <prefix>parked
-- KEYS[5] <prefix>stats
-- ARGV[1] max
-- Returns: {entries moved, ms until the next entry is due (-1: none)}
--
-- 'j:<record>' (an ungrouped job) and 'g:<group>' (a group waiting for its head job's retry,
-- a throttle or its rate limit: claim.lua, finish.lua)
-- go to the tail of ready, or a paused group's lane to parked; 'd:<order>:<n>:<group><record>' (a grouped
-- job enqueued with a delay) joins its group's tail, and the group's lane goes to ready if the
-- group was idle.
local ready, delayed, paused, parked = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix = string.sub(ready, 1, -6)
--@levels
-- (On a cluster, while the queue's slot migrates: wait, before any write. See PROTOCOL.md.)
-- (The probe key never exists: the call also asks for the levels' mark.)
local probe = redis.pcall('EXISTS', prefix .. 'probe', levels_mark)
if type(probe) == 'table' then return redis.error_reply(string.find(probe.err, 'non local', 1, true) and 'TRYAGAIN slot migrating' or probe.err) end
grouped_levels = probe > 0
local max = tonumber(ARGV[1])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, max)
local lanes = {}
local any_paused = #due > 0 and redis.call('EXISTS', paused) == 1
local function lane_of_group(group)
  if any_paused and redis.call('HEXISTS', paused, group) == 1 then
    redis.call('SADD', parked, group)
  else
    lanes[#lanes + 1] = 'g:' .. group
  end
end
for _, member in ipairs(due) do
  local kind = string.sub(member, 1, 2)
  if kind == 'd:' then
    local len, rest = string.match(member, '^d:%d+:(%d+):(.*)$')
    local group = string.sub(rest, 1, tonumber(len))
    if redis.call('RPUSH', prefix .. 'g:' .. group, string.sub(rest, tonumber(len) + 1)) == 1 then
      lane_of_group(group)
      redis.call('HINCRBY', KEYS[5], 'groups', 1)
    end
  elseif kind == 'g:' then
    if redis.call('EXISTS', prefix .. member) == 1 then lane_of_group(string.sub(member, 3)) end
  else
    lanes[#lanes + 1] = member
  end
end
if #due > 0 then redis.call('ZREM', delayed, unpack(due)) end
push_lanes(lanes)
local next_due = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
local wait = -1
if #next_due > 0 then wait = math.max(0, tonumber(next_due[2]) - now) end
return {#due, wait}
