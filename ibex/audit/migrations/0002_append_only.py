"""Audit entries never change: PostgreSQL refuses UPDATE and DELETE of them."""

from django.db import migrations

APPEND_ONLY = """
CREATE FUNCTION audit_refuse_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit entries are append-only' USING ERRCODE = 'restrict_violation';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_auditentry_append_only
    BEFORE UPDATE OR DELETE ON audit_auditentry
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
"""
UNDO = """
DROP TRIGGER audit_auditentry_append_only ON audit_auditentry;
DROP FUNCTION audit_refuse_change();
"""


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_audit_log")]
    operations = [migrations.RunSQL(APPEND_ONLY, UNDO)]
