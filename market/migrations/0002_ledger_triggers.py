"""The ledger's rules in PostgreSQL: transactions balance at commit, entries never change."""

from django.db import migrations

BALANCED = """
CREATE FUNCTION market_check_transaction_balanced() RETURNS trigger AS $$
DECLARE
    unbalanced record;
BEGIN
    SELECT a.currency, sum(e.amount_micros) AS total, count(*) AS lines
      INTO unbalanced
      FROM market_entry e JOIN market_account a ON a.id = e.account_id
     WHERE e.transaction_id = NEW.transaction_id
     GROUP BY a.currency
    HAVING sum(e.amount_micros) <> 0 OR count(*) < 2
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'ledger transaction % does not balance: % % over % entries',
            NEW.transaction_id, unbalanced.total, unbalanced.currency, unbalanced.lines
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE CONSTRAINT TRIGGER market_entry_transaction_balanced
    AFTER INSERT ON market_entry
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION market_check_transaction_balanced();

CREATE FUNCTION market_refuse_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% rows are append-only', TG_TABLE_NAME USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER market_entry_append_only
    BEFORE UPDATE OR DELETE ON market_entry
    FOR EACH ROW EXECUTE FUNCTION market_refuse_change();

CREATE TRIGGER market_ledgertransaction_append_only
    BEFORE UPDATE OR DELETE ON market_ledgertransaction
    FOR EACH ROW EXECUTE FUNCTION market_refuse_change();
"""

UNDO = """
DROP TRIGGER market_ledgertransaction_append_only ON market_ledgertransaction;
DROP TRIGGER market_entry_append_only ON market_entry;
DROP FUNCTION market_refuse_change();
DROP TRIGGER market_entry_transaction_balanced ON market_entry;
DROP FUNCTION market_check_transaction_balanced();
"""


class Migration(migrations.Migration):
    dependencies = [("market", "0001_money")]

    operations = [migrations.RunSQL(BALANCED, UNDO)]
