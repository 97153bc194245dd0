-- patch a running room in one step: ARGV[3] = the fields to set, as JSON
-- named like the meta fields (only those given change, so two patches of
-- different fields made at once both take effect). A new `capacity` moves
-- permits by the plans of rules::resize (RESIZE_GROW, RESIZE_SHRINK).
-- Returns {r = 'ok', view = {...}} | {r = 'noroom'} | {r = 'closed'}
if not room({'closed', 'capacity', 'hand', 'tray', 'debt'}) then return reply({r = 'noroom'}) end
if M['closed'] == '1' then return reply({r = 'closed'}) end
local fields = cjson.decode(ARGV[3])
if fields.capacity then
  local new, old = tonumber(fields.capacity), n('capacity')
  local plan, left = RESIZE_GROW, new - old
  if new < old then plan, left = RESIZE_SHRINK, old - new end
  for _, from in ipairs(plan.from) do
    local take = math.min(n(from), left)
    if take > 0 then incr(from, -take) end
    left = left - take
  end
  if left > 0 then incr(plan.to, left) end
end
for field, value in pairs(fields) do set(field, value) end
changed()
return reply({r = 'ok', view = view_fields()})
