-- purchase: the origin sold ARGV[3] units. They are taken off the room's
-- stock, never below zero, and with none left the room turns sold out in
-- the same step (rules::take_stock is the rule; the conformance suite holds
-- this script to it). Done whole in Redis, so reports racing on several
-- instances each take one step, no retries, and exactly one of them turns
-- the room sold out.
-- Returns {r = 'ok', left, before, mode, sold_out_now, view = {...}}
--       | {r = 'nostock'} | {r = 'noroom'}
if not room({'stock', 'mode'}) then return reply({r = 'noroom'}) end
if not M['stock'] or M['stock'] == '' then return reply({r = 'nostock'}) end
local before = mode()
local left = math.max(tonumber(M['stock']) - tonumber(ARGV[3]), 0)
local after = before
if left == 0 then after = MODE_SOLD_OUT end
set('stock', S(left))
set('mode', after)
changed()
return reply({r = 'ok', left = left, before = before, mode = after,
  sold_out_now = MODE_CLOSES[after] == true and MODE_CLOSES[before] ~= true,
  view = view_fields()})
