from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("placement", "0007_booking_checked_once_a_statement"),
    ]

    operations = [
        migrations.AddField(
            model_name="model",
            name="reconciled_digest",
            field=models.CharField(blank=True, default="", editable=False, max_length=32),
        ),
    ]
