-- purchase, as a compare-and-set on the room's stock: ARGV[3] = the stock
-- the caller computed from, ARGV[4] = what is left after the purchase and
-- ARGV[5] = '1' when that takes the last unit (rules::take_stock decides
-- both, in Rust). Written only if the stock is still ARGV[3]; else the
-- answer is 'moved' with the stock as it is, and the caller computes
-- again. The mode turns sold out in the same step, so however many
-- instances report at once, the stock never goes below zero and exactly
-- one of them ends the sale.
-- Returns {r = 'ok', view = {...}} | {r = 'moved', stock} | {r = 'nostock'}
--       | {r = 'noroom'}
if not room({'stock', 'mode'}) then return reply({r = 'noroom'}) end
if not M['stock'] or M['stock'] == '' then return reply({r = 'nostock'}) end
if M['stock'] ~= ARGV[3] then return reply({r = 'moved', stock = tonumber(M['stock'])}) end
set('stock', ARGV[4])
if ARGV[5] == '1' then set('mode', MODE_SOLD_OUT) end
changed()
return reply({r = 'ok', view = view_fields()})
