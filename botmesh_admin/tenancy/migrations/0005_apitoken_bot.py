"""Bind bot-role API tokens to one bot id (``ApiToken.bot``).

Existing bot tokens are bound to their name, the bot id the README told them to carry
(``botmesh_token create <tenant> --name <bot> --role bot``); a name that is no bot id (over 63
characters, a lone surrogate) leaves the token bound to no bot: it is refused on ``…/bots/{bot}/…``.
"""

from django.db import migrations, models


def bind_bot_tokens(apps, schema_editor):  # type: ignore[no-untyped-def]
    ApiToken = apps.get_model("tenancy", "ApiToken")  # noqa: N806 - Django's historical model idiom
    for token in ApiToken.objects.filter(role="bot", bot__isnull=True).only("pk", "name"):
        if 1 <= len(token.name) <= 63:
            ApiToken.objects.filter(pk=token.pk).update(bot=token.name)


class Migration(migrations.Migration):
    dependencies = [("tenancy", "0004_last_tenant")]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="bot",
            field=models.CharField(blank=True, help_text="the bot a bot-role token acts as", max_length=63, null=True),
        ),
        migrations.RunPython(bind_bot_tokens, migrations.RunPython.noop),
    ]
