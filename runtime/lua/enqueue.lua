-- Stores a batch of jobs, in order.
-- KEYS[1] <prefix>ready  KEYS[2] <prefix>seq  KEYS[3] <prefix>ids  KEYS[4] <prefix>stats
-- ARGV[1] n, then n times: id ('' = assign one), group ('' = ungrouped), body
-- Returns: n times: id, duplicate (1: a job with this producer-given id is pending or running)
--
-- A job is stored as the record '<attempts before>|<id>|<body>': ungrouped, as the lane
-- 'j:<record>' in ready; grouped, at the tail of <prefix>g:<group>, and the lane 'g:<group>'
-- goes to ready only when that list was empty (the group had no pending or running job).
local ready, seq, ids, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix = string.sub(ready, 1, -6)
local n = tonumber(ARGV[1])

local function push_all(key, values)
  local len = 0
  for first = 1, #values, 4000 do
    len = redis.call('RPUSH', key, unpack(values, first, math.min(first + 3999, #values)))
  end
  return len
end

local missing = 0
for i = 0, n - 1 do
  local id = ARGV[2 + i * 3]
  if id == '' then missing = missing + 1 end
  if string.find(id, '|', 1, true) then return redis.error_reply("job id '" .. id .. "' contains '|'") end
end
local next_id = 0
if missing > 0 then next_id = redis.call('INCRBY', seq, missing) - missing end

local out, lanes, groups, order, slot = {}, {}, {}, {}, {}
local stored = 0
for i = 0, n - 1 do
  local id, group, body = ARGV[2 + i * 3], ARGV[3 + i * 3], ARGV[4 + i * 3]
  local duplicate = 0
  if id == '' then
    next_id = next_id + 1
    id = tostring(next_id)
  elseif redis.call('SADD', ids, id) == 0 then
    duplicate = 1
  end
  out[#out + 1] = id
  out[#out + 1] = duplicate
  if duplicate == 0 then
    stored = stored + 1
    local record = '0|' .. id .. '|' .. body
    if group == '' then
      lanes[#lanes + 1] = 'j:' .. record
    else
      local list = groups[group]
      if not list then
        list = {}
        groups[group] = list
        order[#order + 1] = group
        lanes[#lanes + 1] = false -- the group's lane, if it turns out to be idle
        slot[group] = #lanes
      end
      list[#list + 1] = record
    end
  end
end

for _, group in ipairs(order) do
  local list = groups[group]
  if push_all(prefix .. 'g:' .. group, list) == #list then lanes[slot[group]] = 'g:' .. group end
end
local final = {}
for i = 1, #lanes do
  if lanes[i] then final[#final + 1] = lanes[i] end
end
push_all(ready, final)
if stored > 0 then redis.call('HINCRBY', stats, 'enqueued', stored) end
return out
