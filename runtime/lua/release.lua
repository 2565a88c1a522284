-- A stopping worker gives back leased jobs it did not start or whose handlers the stop cut
-- short, and lanes its blocking claim took: they go back to the head of ready, in their order,
-- with no attempt counted, and leave the started counter (they start again later). Their
-- groups leave jumped: a burst ends with its lease (see finish.lua), and a rate-limited group
-- gets back the start claim.lua counted (the newest in <prefix>rate:<group>: one lease a group),
-- as does the queue's own rate limit (the lease's fence in <prefix>rate).
-- KEYS[1] <prefix>ready  KEYS[2] <prefix>active  KEYS[3] <prefix>stats  KEYS[4] <prefix>claimed:<worker>
-- KEYS[5] <prefix>jumped
-- ARGV: the tokens
-- Returns: how many jobs went back.
local ready, active, stats, claimed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix = string.sub(ready, 1, -6)
--@levels
local lanes = {}
local released, regrouped = 0, 0
local conc_back = {} -- leases of jobs of groups that run several at once: {fence, lane}
for _, token in ipairs(ARGV) do
  if redis.call('ZREM', active, token) == 1 then
    local lane = string.sub(token, string.find(token, '|', 1, true) + 1)
    redis.call('ZREM', prefix .. 'rate', string.match(token, '^(%d+)|')) -- (claim.lua)
    if string.sub(lane, 1, 2) == 'c:' then -- (below)
      conc_back[#conc_back + 1] = {fence = tonumber(string.match(token, '^(%d+)|')), lane = lane}
      lane = nil
    elseif string.sub(lane, 1, 2) == 'g:' then
      redis.call('SREM', KEYS[5], string.sub(lane, 3))
      redis.call('LPOP', string.sub(ready, 1, -6) .. 'rate:' .. string.sub(lane, 3))
    end
    if lane then lanes[#lanes + 1] = lane end
    released = released + 1
  end
end
-- A job of a group that runs several at once: back to its group's head (finish.lua's conc_end),
-- from the last leased to the first (so they stand in lease order); the group's lane to the
-- head of ready when nothing held it.
table.sort(conc_back, function(x, y) return x.fence > y.fence end)
for _, c in ipairs(conc_back) do
  local n, at = string.match(c.lane, '^c:(%d+):()')
  n = tonumber(n)
  local group, record = string.sub(c.lane, at, at + n - 1), string.sub(c.lane, at + n)
  redis.call('LPOP', prefix .. 'rate:' .. group)
  if redis.call('HINCRBY', prefix .. 'running', group, '-1') <= 0 then redis.call('HDEL', prefix .. 'running', group) end
  local was_full = redis.call('SREM', prefix .. 'full', group) == 1
  local fresh = redis.call('LPUSH', prefix .. 'g:' .. group, record) == 1
  if fresh then regrouped = regrouped + 1 end
  if fresh or was_full then lanes[#lanes + 1] = 'g:' .. group end
end
for _, lane in ipairs(redis.call('LRANGE', claimed, 0, -1)) do lanes[#lanes + 1] = lane end
redis.call('DEL', claimed)
push_lanes(lanes, true)
if released > 0 then redis.call('HINCRBY', stats, 'started', -released) end
if regrouped > 0 then redis.call('HINCRBY', stats, 'groups', regrouped) end
return #lanes
